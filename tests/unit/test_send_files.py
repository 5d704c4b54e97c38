import json
import os
import stat


def _place(tmp_path, capsys, files, **more):
    from ansible.module_utils.testing import patch_module_args

    from ansible_collections.torchfleet.cluster.plugins.modules import send_files

    with patch_module_args({"staged_dir": str(tmp_path / "staged"), "dest_dir": str(tmp_path / "dest" / "sub"),
                            "files": files, **more}):
        try:
            send_files.main()
        except SystemExit:
            pass
    return json.loads(capsys.readouterr().out)


def test_staged_files_replace_their_old_copies_with_the_mode_in_a_folder_made_for_them(tmp_path, capsys):
    (tmp_path / "staged").mkdir()
    for name in ("a.whl", ".stamp"):
        (tmp_path / "staged" / name).write_text(f"new {name}")
        (tmp_path / "staged" / name).chmod(0o600)
    result = _place(tmp_path, capsys, ["a.whl", ".stamp"], mode="0644", dir_mode="0750")
    assert result["changed"] and result["sent"] == ["a.whl", ".stamp"]
    dest = tmp_path / "dest" / "sub"
    assert stat.S_IMODE(dest.stat().st_mode) == 0o750
    for name in ("a.whl", ".stamp"):
        assert (dest / name).read_text() == f"new {name}"
        assert stat.S_IMODE((dest / name).stat().st_mode) == 0o644 and (dest / name).stat().st_uid == os.geteuid()
        assert not (tmp_path / "staged" / name).exists()

    # An old copy is replaced; the folder's mode is left as it is.
    (tmp_path / "staged" / "a.whl").write_text("newer")
    dest.chmod(0o755)
    assert _place(tmp_path, capsys, ["a.whl"])["changed"]
    assert (dest / "a.whl").read_text() == "newer" and stat.S_IMODE(dest.stat().st_mode) == 0o755


def test_nothing_to_send_changes_nothing(tmp_path, capsys):
    (tmp_path / "staged").mkdir()
    (tmp_path / "dest" / "sub").mkdir(parents=True)
    assert _place(tmp_path, capsys, []) | {"invocation": None} == {"changed": False, "sent": [], "invocation": None}
