"""mkdocs hooks: keep the site in step with the code without hand-kept lists.

* Method pages written next to the code (mixing, certified attention, token
  identifiability) join the "Methods" section when they exist; any other Markdown page
  not in the nav joins it too, so no page is left unreachable and no missing page fails
  the build.
* `<!-- cli-reference -->` in cli.md becomes the reference of every command, read from
  the Typer app itself (options, defaults, help), so it cannot drift from the CLI.
* `<!-- api-more -->` in api/index.md becomes an API entry for every public name of
  `identifiable` that no API page documents yet.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

METHOD_PAGES = [
    ("Token identifiability", "token_identifiability.md"),
    ("Certified attention", "certified_attention.md"),
    ("Attention posterior", "posterior.md"),
    ("Context mixing", "mixing.md"),
    ("Whole-model scans", "scan.md"),
]
SKIP_DIRS = {"_hooks"}


def _listed(nav: Any) -> set[str]:
    found: set[str] = set()
    if isinstance(nav, str):
        found.add(nav)
    elif isinstance(nav, dict):
        for value in nav.values():
            found |= _listed(value)
    elif isinstance(nav, list):
        for item in nav:
            found |= _listed(item)
    return found


def _title(path: Path) -> str:
    for line in path.read_text("utf-8").splitlines():
        if line.startswith("# "):
            return line[2:].strip()
    return path.stem.replace("_", " ").capitalize()


def on_config(config: Any) -> Any:
    docs = Path(config["docs_dir"])
    nav = config["nav"]
    listed = _listed(nav)
    methods: list[dict[str, str]] = [
        {title: name} for title, name in METHOD_PAGES if (docs / name).is_file()
    ]
    listed |= {name for entry in methods for name in entry.values()}
    for path in sorted(docs.rglob("*.md")):
        rel = path.relative_to(docs).as_posix()
        if rel not in listed and not SKIP_DIRS & set(path.relative_to(docs).parts):
            methods.append({_title(path): rel})
    for k, entry in enumerate(nav):
        if isinstance(entry, dict) and "Methods" in entry:
            if methods:
                nav[k] = {"Methods": methods}
            else:
                del nav[k]
            break
    return config


def _cli_reference() -> str:
    import typer

    from identifiable.cli import _register_all, app

    _register_all()
    group = typer.main.get_command(app)
    out = []
    for name in group.list_commands(None):  # type: ignore[arg-type]
        cmd = group.get_command(None, name)  # type: ignore[arg-type]
        if cmd is None or getattr(cmd, "hidden", False):
            continue
        out.append(f"## `identifiable {name}`\n")
        if cmd.help:
            out.append(cmd.help.strip().split("\f")[0] + "\n")
        rows = []
        for p in cmd.params:
            if getattr(p, "hidden", False) or p.name == "help":
                continue
            if p.param_type_name == "argument":
                what = f"`{p.name.upper()}`"
                default = "required" if p.required else ""
            else:
                what = ", ".join(f"`{o}`" for o in [*p.opts, *p.secondary_opts])
                default = "" if p.default is None or p.default is False or callable(p.default) else p.default
                default = f"`{default}`" if default != "" else ""
            text = " ".join((getattr(p, "help", None) or "").split()).replace("|", "\\|")
            rows.append(f"| {what} | {text} | {default} |")
        if rows:
            out.append("| argument or option | meaning | default |\n| --- | --- | --- |")
            out.extend(rows)
        out.append("")
    return "\n".join(out)


def _api_more(docs: Path) -> str:
    import identifiable

    api_text = "\n".join(p.read_text("utf-8") for p in (docs / "api").glob("*.md"))
    documented = set(re.findall(r"^:::\s+[\w.]*?\.?(\w+)\s*$", api_text, re.M))
    missing = [
        name
        for name in identifiable._EXPORTS  # names, not the subpackages of __all__
        if identifiable._RENAMED.get(name, name) not in documented
    ]
    if not missing:
        return ""
    lines = ["## More public names", ""]
    for name in missing:
        lines += [f"::: {identifiable._EXPORTS[name]}.{identifiable._RENAMED.get(name, name)}", ""]
    return "\n".join(lines)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    src = page.file.src_uri
    if src == "cli.md" and "<!-- cli-reference -->" in markdown:
        markdown = markdown.replace("<!-- cli-reference -->", _cli_reference())
    if src == "api/index.md" and "<!-- api-more -->" in markdown:
        markdown = markdown.replace("<!-- api-more -->", _api_more(Path(config["docs_dir"])))
    return markdown
