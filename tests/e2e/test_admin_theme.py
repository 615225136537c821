"""The Django admin in the user's own theme (UserPreferences.theme, chosen on any page):
dark when they chose dark over a light system, light over a dark one, the system's when
they chose "system"; the admin's own toggle saves the same preference; and axe finds no
contrast (or other serious) violations over the admin's pages in either palette.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest

from sessions.models import Session, UserPreferences
from tests.e2e.pages import AXE, MODEL, ROOT_PASSWORD, sign_in_admin

pytestmark = [pytest.mark.distributed, pytest.mark.django_db(transaction=True)]

# Django's own filter widget (admin/js/SelectFilter2.js) puts a title-like aria-label on a
# bare <span> (aria-prohibited-attr): Django's markup, not a theme matter, left to upstream.
DJANGO_WIDGET_ICONS = ".help-tooltip.search-label-icon"
RUN_AXE = """async (skip) => {
  const context = { include: [document], exclude: [[skip]] };
  const result = await axe.run(context, { resultTypes: ["violations"] });
  return result.violations.filter((v) => v.impact === "serious" || v.impact === "critical")
    .map((v) => `${v.id}: ${v.nodes.slice(0, 3).map((n) => n.target.join(" ")).join(", ")}`);
}"""
# The admin pages an admin reads most: the index, lists, a change form, the custom pages.
PAGES = {
    "index": "/admin/",
    "users": "/admin/auth/user/",
    "sessions": "/admin/chat_sessions/session/",
    "compaction settings": "/admin/chat_sessions/compactionsettings/",
    "usage": "/admin/chat_sessions/usagereport/",
    "matrix add": "/admin/providers/matrixmodel/add/",
}


@pytest.fixture
def admin_page(browser: Any, stack: str, shot: Any) -> Iterator[Any]:
    contexts: list[Any] = []

    def make(scheme: str) -> Any:
        context = browser.new_context(viewport={"width": 1280, "height": 800}, color_scheme=scheme)
        contexts.append(context)
        page = context.new_page()
        page.set_default_timeout(15_000)
        shot.pages.append(page)
        sign_in_admin(page, stack, "root", ROOT_PASSWORD)
        return page

    yield make
    for context in contexts:
        context.close()


def body_background(page: Any) -> tuple[int, ...]:
    value = page.evaluate("getComputedStyle(document.body).backgroundColor")
    return tuple(int(n) for n in re.findall(r"\d+", value)[:3])


def is_dark(page: Any) -> bool:
    return sum(body_background(page)) < 3 * 80


@pytest.mark.parametrize(
    ("chosen", "system", "dark"),
    [
        pytest.param("dark", "light", True, id="dark-over-light-system"),
        pytest.param("light", "dark", False, id="light-over-dark-system"),
        pytest.param("system", "dark", True, id="system-dark"),
        pytest.param("system", "light", False, id="system-light"),
    ],
)
def test_the_admin_follows_the_users_theme_and_is_readable(
    admin_page, shot, stack, root, chosen, system, dark
):
    UserPreferences.objects.update_or_create(user=root, defaults={"theme": chosen})
    Session.objects.create(owner=root, model=MODEL, title="Listed in the admin")
    page = admin_page(system)
    found = {}
    for name, path in PAGES.items():
        page.goto(f"{stack}{path}")
        assert page.evaluate("document.documentElement.dataset.theme") == chosen
        assert is_dark(page) == dark, (name, body_background(page))
        assert page.input_value("#theme-admin") == chosen
        page.add_script_tag(url=AXE)
        found[name] = page.evaluate(RUN_AXE, DJANGO_WIDGET_ICONS)
        shot(page, f"admin {name}")
    assert found == {name: [] for name in found}, found


def test_the_admins_toggle_saves_the_users_theme(admin_page, shot, stack, root):
    page = admin_page("light")
    assert not is_dark(page)
    page.select_option("#theme-admin", "dark")
    page.wait_for_function("() => document.documentElement.dataset.theme === 'dark'")
    assert is_dark(page)
    for _ in range(50):  # the choice is saved in the background (fetch)
        if UserPreferences.objects.filter(user=root, theme="dark").exists():
            break
        page.wait_for_timeout(100)
    assert UserPreferences.objects.get(user=root).theme == "dark"
    page.reload()
    assert is_dark(page), "the choice outlives a reload"
    shot(page, "admin dark chosen in the admin")
    # The product's pages follow the same choice.
    page.goto(f"{stack}/settings/")
    assert page.evaluate("document.documentElement.dataset.theme") == "dark"
