"""A cache folder fxwrap cannot write is a warning and a process-private cache (the
program compiles and runs); a debug-dump folder that cannot be written is an error that
names the folder, where it came from and what to do."""
import os
import warnings

import pytest
import torch

import fxwrap
from fxwrap.runtime.graph_records import kernels_of


def _f(x):
    return (x.sin() * 3).relu() + x.sum()


@pytest.mark.parametrize("program_cache", ["0", "1"], ids=["kernels", "programs+kernels"])
def test_a_cache_folder_under_a_file_warns_and_compiles_uncached(tmp_path, monkeypatch, program_cache):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("FXWRAP_CACHE_DIR", str(blocker / "cache"))
    monkeypatch.setenv("FXWRAP_PROGRAM_CACHE", program_cache)
    x = torch.randn(33)
    with pytest.warns(UserWarning, match=rf"FXWRAP_CACHE_DIR={blocker / 'cache'} cannot be written "
                                         r"\(NotADirectoryError.*caching in .*fxwrap-cache-.* for this process only"):
        program = fxwrap.lower(_f, x, target="cpu")
    assert kernels_of(program.graph_module)  # compiled C++, cached in the temporary folder
    torch.testing.assert_close(program.run(x), _f(x))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per folder, not once per kernel or program
        x2 = torch.randn(33)
        torch.testing.assert_close(fxwrap.lower(_f, x2, target="cpu").run(x2), _f(x2))


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through folder permissions")
def test_a_read_only_cache_folder_warns_and_compiles(tmp_path, monkeypatch):
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    monkeypatch.setenv("FXWRAP_CACHE_DIR", str(folder))
    x = torch.randn(17)
    with pytest.warns(UserWarning, match="PermissionError"):
        program = fxwrap.lower(_f, x, target="cpu")
    torch.testing.assert_close(program.run(x), _f(x))


def test_a_debug_dir_that_is_a_file_names_it_and_the_variable(tmp_path, monkeypatch):
    notes = tmp_path / "notes.txt"
    notes.write_text("a file")
    monkeypatch.setenv("FXWRAP_DEBUG_DIR", str(notes))
    with pytest.raises(Exception, match=rf"cannot write the debug dump to {notes} \(FXWRAP_DEBUG_DIR\) "
                                        r"\(FileExistsError.*point FXWRAP_DEBUG_DIR at a folder you can write"):
        fxwrap.lower(_f, torch.randn(8), target="cpu")
    monkeypatch.delenv("FXWRAP_DEBUG_DIR")
    with pytest.raises(Exception, match=r"\(the debug_dir option\).*give debug_dir a folder you can write"):
        fxwrap.lower(_f, torch.randn(8), target="cpu", options={"debug_dir": str(notes / "sub")})

