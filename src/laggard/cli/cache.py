"""`laggard cache`: where loaded jobs are cached, what the cache holds, and clearing it
(``laggard.io.cache``)."""

from __future__ import annotations

from typing import Annotated

import typer


def cache(
    clear: Annotated[bool, typer.Option("--clear", help="Remove every cached job.")] = False,
) -> None:
    """The job cache: its directory, entries and size (`--clear` empties it)."""
    import time

    from laggard.io.cache import clear as clear_cache
    from laggard.io.cache import configured, entries, entry_source, switched_off

    cfg = configured()  # its directory and size cap, whether or not LAGGARD_NO_CACHE turns it off
    if clear:
        n, size = clear_cache(cfg)
        typer.echo(f"removed {n} cached job(s), {size / 2**20:.1f} MiB, from {cfg.directory}")
        return
    found = entries(cfg)
    total = sum(size for _, size, _ in found)
    off = " (off: LAGGARD_NO_CACHE is set; commands neither read nor fill it)" if switched_off() else ""
    typer.echo(f"{cfg.directory}: {len(found)} cached job(s), "
               f"{total / 2**20:.1f} MiB of {cfg.max_bytes / 2**30:g} GiB{off}")
    for path, size, used in reversed(found):
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(used))
        typer.echo(f"  {size / 2**20:8.1f} MiB  last used {when}  {' '.join(entry_source(path)) or path.name}")


def register(app: typer.Typer) -> None:
    app.command()(cache)
