"""The one writer of output files (plan files, exported configurations).

:func:`check_target` is the up-front check (run before any work, so an existing ``-o`` is
refused before a long search, not after it); :func:`write_file` writes atomically and
exclusively:

* the text goes to a temporary file in the target's folder with a short fixed-length name
  (``.shardplan-XXXXXXXX.tmp``, so any legal target name up to NAME_MAX works), is flushed and
  fsynced, then committed in one step: without ``force`` by ``link(2)`` (fails if the target
  appeared meanwhile: a file created between the check and the commit is never overwritten),
  with ``force`` by ``rename(2)`` over the regular file that is there. Readers see the old
  file or the complete new one, never a part; nothing is left behind on failure or interrupt.
* only regular files are ever replaced: a symbolic link (dangling or not; ``/proc/self/fd/1``),
  a character or block device (``/dev/null``), a FIFO, a socket or a directory at the target is
  refused, ``--force`` or not. (Write to standard output with ``-o -``.)
* every failure is a :class:`PlannerError` naming the path: missing or non-folder parent,
  a name longer than the file system allows, permission denied, a full disk (``output_error``,
  exit 2: an output problem, not a bug).

``critical`` (a context-manager factory) wraps the commit step and the cleanup, and
``on_commit`` runs inside it once the file is in place: the CLI passes its signal deferral there
(:mod:`cli.signals`), so a signal can never split "file committed" from "temporary removed".
"""
from __future__ import annotations

import contextlib
import errno
import os
import stat
import tempfile
from pathlib import Path
from typing import Callable, ContextManager

from planner.errors import invalid, output_error

TEMP_PREFIX, TEMP_SUFFIX = ".shardplan-", ".tmp"
_NO_HARD_LINKS = {errno.EPERM, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK, errno.ENOSYS,
                  getattr(errno, "ENOTSUP", errno.EOPNOTSUPP)}


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISDIR, "a directory"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISFIFO, "a named pipe"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def _folder(target: Path) -> Path:
    return target.parent if str(target.parent) else Path(".")


def check_target(path: str | os.PathLike, *, force: bool = False) -> Path:
    """Refuse, before any work, an output path :func:`write_file` would refuse."""
    target = Path(path)
    if str(path) == "" or target.name in ("", ".", ".."):
        raise invalid(f"cannot write {str(path)!r}: not a file name")
    folder = _folder(target)
    try:
        info = os.lstat(target)
    except FileNotFoundError:
        info = None
    except OSError as error:
        raise _os_error(target, error) from None
    except ValueError:  # NUL in the name
        raise invalid(f"cannot write {target}: the name contains a NUL character") from None
    if info is not None:
        if stat.S_ISLNK(info.st_mode):
            pointed = os.readlink(target)
            dangling = not os.path.exists(target)
            raise invalid(f"{target} is a symbolic link{' to a missing file' if dangling else ''} "
                          f"({pointed}); not replacing it",
                          "give the path of a regular file (or of the link's target), or use "
                          "-o - for standard output", path=str(target))
        if stat.S_ISDIR(info.st_mode):
            raise invalid(f"output path {target} is a directory", path=str(target))
        if not stat.S_ISREG(info.st_mode):
            raise invalid(f"{target} is {_kind(info.st_mode)}, not a regular file; not "
                          f"replacing it, with --force or without",
                          "use -o - to write to standard output", path=str(target))
        if not force:
            raise invalid(f"{target} exists; not overwriting it", "pass --force to replace it",
                          path=str(target))
    try:
        folder_info = os.stat(folder)
    except FileNotFoundError:
        raise invalid(f"cannot write {target}: {folder} does not exist") from None
    except NotADirectoryError:
        raise invalid(f"cannot write {target}: {_first_file(folder)} is a file, not a "
                      f"folder") from None
    except OSError as error:
        raise _os_error(target, error) from None
    if not stat.S_ISDIR(folder_info.st_mode):
        raise invalid(f"cannot write {target}: {folder} is a file, not a folder")
    try:
        name_max = os.pathconf(folder, "PC_NAME_MAX")
    except (OSError, ValueError):
        name_max = 255
    if len(os.fsencode(target.name)) > name_max:
        raise invalid(f"cannot write {target}: the file name is {len(os.fsencode(target.name))} "
                      f"bytes; this file system allows {name_max}")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise output_error(f"cannot write {target}: permission denied in {folder}",
                           path=str(target))
    return target


def _first_file(folder: Path) -> Path:
    """The first component of ``folder`` that exists and is not a folder."""
    for part in reversed([folder, *folder.parents]):
        if part.exists() and not part.is_dir():
            return part
    return folder


def _os_error(target: Path, error: OSError):
    if error.errno == errno.ELOOP:
        return invalid(f"cannot write {target}: too many levels of symbolic links (a loop)")
    if error.errno == errno.ENAMETOOLONG:
        return invalid(f"cannot write {target}: the name is too long for the file system "
                       f"(the file name is {len(os.fsencode(target.name))} bytes)")
    if error.errno in (errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EROFS, errno.EACCES,
                       errno.EPERM, errno.EFBIG):
        return output_error(f"cannot write {target}: {error.strerror}", path=str(target))
    return invalid(f"cannot write {target}: {error.strerror or error}", path=str(target))


def _fsync_folder(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _commit_exclusive(tmp: str, target: Path) -> None:
    """Make ``tmp`` appear at ``target`` only if nothing is there (atomically)."""
    try:
        os.link(tmp, target)
        return
    except FileExistsError:
        raise invalid(f"{target} appeared while the output was being written; not "
                      f"overwriting it", "pass --force to replace it", path=str(target)) from None
    except OSError as error:
        if error.errno not in _NO_HARD_LINKS:
            raise
    # A file system without hard links: claim the name exclusively, then rename over the claim.
    try:
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise invalid(f"{target} appeared while the output was being written; not "
                      f"overwriting it", "pass --force to replace it", path=str(target)) from None
    os.close(fd)
    os.replace(tmp, target)


def _commit_replace(tmp: str, target: Path) -> None:
    try:
        info = os.lstat(target)
    except FileNotFoundError:
        info = None
    if info is not None and not stat.S_ISREG(info.st_mode):
        raise invalid(f"{target} became {_kind(info.st_mode)} while the output was being "
                      f"written; not replacing it", path=str(target))
    os.replace(tmp, target)


def write_file(text: str | bytes, path: str | os.PathLike, *, force: bool = False,
               critical: Callable[[], ContextManager] = contextlib.nullcontext,
               on_commit: Callable[[], None] | None = None) -> Path:
    """Write ``text`` (UTF-8; bytes as they are, e.g. a PNG) to ``path`` atomically and
    exclusively (see the module doc)."""
    target = check_target(path, force=force)
    folder = _folder(target)
    data = text if isinstance(text, bytes) else text.encode("utf-8")
    try:
        fd, tmp = tempfile.mkstemp(prefix=TEMP_PREFIX, suffix=TEMP_SUFFIX, dir=folder)
    except OSError as error:
        raise _os_error(target, error) from None
    linked = False
    try:
        try:
            os.fchmod(fd, 0o666 & ~_umask())  # mkstemp makes 0600; a plan is an ordinary file
            view = memoryview(data)
            while view:
                written = os.write(fd, view)
                view = view[written:]
            os.fsync(fd)
        finally:
            os.close(fd)
        with critical():
            if force:
                _commit_replace(tmp, target)
            else:
                _commit_exclusive(tmp, target)
                linked = True  # tmp is a second name of the target now
            _fsync_folder(folder)
            if on_commit is not None:
                on_commit()
            if linked:
                os.unlink(tmp)
    except OSError as error:
        with critical():
            _remove(tmp)
        raise _os_error(target, error) from None
    except BaseException:
        with critical():
            _remove(tmp)
        raise
    return target


def _remove(tmp: str) -> None:
    try:
        os.unlink(tmp)
    except OSError:
        pass
