"""`eagle3-patches status` says what stopped sglang's import once, and the CPU-profile hint only where it helps."""

from __future__ import annotations

from eagle3_patches.cli.status_cmd import _import_failure


def _missing(name):
    exc = ModuleNotFoundError(f"No module named {name!r}")
    exc.name = name
    return exc


def test_a_missing_sglang_dependency_is_named_with_its_install_command():
    msg = _import_failure(_missing("tqdm"), cpu_profile=False)
    assert msg == "sglang needs the module 'tqdm', which is not installed in this Python: pip install tqdm"
    assert "--cpu-profile" not in msg


def test_a_missing_cuda_only_package_suggests_the_cpu_profile():
    assert "add --cpu-profile" in _import_failure(_missing("sgl_kernel"), cpu_profile=False)
    assert "add --cpu-profile" not in _import_failure(_missing("sgl_kernel"), cpu_profile=True)


def test_one_cause_is_reported_once_for_every_module_it_stopped(monkeypatch, capsys):
    import importlib

    import eagle3_patches
    from eagle3_patches.cli import status_cmd

    real = importlib.import_module

    def fake_import(name, *a, **k):
        if name.startswith("sglang."):
            raise _missing("tqdm")
        return real(name, *a, **k)

    monkeypatch.setattr(
        status_cmd, "installed_sglang_version", lambda: __import__("packaging.version").version.Version("0.5.9")
    )
    monkeypatch.setattr(status_cmd.importlib, "import_module", fake_import)
    try:
        report = status_cmd.resolve_status()
    finally:
        eagle3_patches.revert()
    errors = report["import_errors"]
    assert list(errors) == ["sglang needs the module 'tqdm', which is not installed in this Python: pip install tqdm"]
    assert len(errors[next(iter(errors))]) >= 5  # every sglang module the patches wait for, in one line
