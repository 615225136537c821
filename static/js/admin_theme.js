// The Django admin's <html> is Django's template: put the user's theme (system, light or
// dark; admin/css/dark_mode.css reads it) on it before the first paint. A classic script
// in <head>, so it runs before the body renders; the value is on its own tag (no inline JS).
document.documentElement.dataset.theme = document.currentScript.dataset.theme || "system";
