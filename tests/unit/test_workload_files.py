"""workload_files (run_state): the node's copy of a workload is replaced whole, or not at all."""

import io
import tarfile

import pytest

from ansible_collections.torchfleet.cluster.plugins.module_utils import workload_files


def _tar(path, members):
    with tarfile.open(path, "w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            if data is None:
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
            elif isinstance(data, tuple):
                info.type, info.linkname = tarfile.SYMTYPE, data[1]
                tar.addfile(info)
            else:
                info.size, info.mode = len(data), 0o644
                tar.addfile(info, io.BytesIO(data))
    return path


def test_a_new_copy_replaces_the_old_whole_and_the_tar_is_kept(tmp_path):
    dest, keep = tmp_path / "workloads" / "job", tmp_path / "workloads" / "job.tar"
    workload_files.unpack(str(_tar(tmp_path / "a.tar", {"old.py": b"1", "pkg": None, "pkg/m.py": b"2"})),
                          str(dest), keep=str(keep))
    assert sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*")) == ["old.py", "pkg", "pkg/m.py"]
    workload_files.unpack(str(_tar(tmp_path / "b.tar", {"pkg": None, "pkg/m.py": b"3"})), str(dest), keep=str(keep))
    assert sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*")) == ["pkg", "pkg/m.py"]
    assert (dest / "pkg" / "m.py").read_bytes() == b"3"
    assert tarfile.open(keep).getnames() == ["pkg", "pkg/m.py"] and not (tmp_path / "b.tar").exists()
    # Nothing of the swap is left beside the folder.
    assert sorted(p.name for p in dest.parent.iterdir()) == ["job", "job.tar"]


@pytest.mark.parametrize("members", [{"../evil.py": b"x"}, {"/etc/evil": b"x"}, {"link": ("sym", "/etc/passwd")}],
                         ids=["dotdot", "absolute", "symlink"])
def test_a_member_outside_the_folder_is_refused_and_the_old_copy_stays(tmp_path, members):
    dest = tmp_path / "job"
    workload_files.unpack(str(_tar(tmp_path / "a.tar", {"train.py": b"ok"})), str(dest))
    with pytest.raises(ValueError):
        workload_files.unpack(str(_tar(tmp_path / "b.tar", {"train.py": b"new", **members})), str(dest))
    assert (dest / "train.py").read_bytes() == b"ok"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.tar", "b.tar", "job"]


def test_install_takes_the_tar_inline_or_from_the_node_and_leaves_no_temporary(tmp_path):
    import base64

    dest, keep = tmp_path / "workloads" / "job", tmp_path / "workloads" / "job.tar"
    data = _tar(tmp_path / "a.tar", {"train.py": b"inline"}).read_bytes()
    workload_files.install({"dest": str(dest), "keep": str(keep), "data": base64.b64encode(data).decode()})
    assert (dest / "train.py").read_bytes() == b"inline" and keep.read_bytes() == data
    sent = _tar(tmp_path / "sent.tar", {"train.py": b"sent"})
    workload_files.install({"dest": str(dest), "keep": str(keep), "src": str(sent)})
    assert (dest / "train.py").read_bytes() == b"sent" and not sent.exists()
    assert sorted(p.name for p in dest.parent.iterdir()) == ["job", "job.tar"]
    # A refused tar leaves neither its temporary nor a changed folder.
    bad = _tar(tmp_path / "bad.tar", {"../evil.py": b"x"}).read_bytes()
    with pytest.raises(ValueError):
        workload_files.install({"dest": str(dest), "keep": str(keep), "data": base64.b64encode(bad).decode()})
    assert (dest / "train.py").read_bytes() == b"sent"
    assert sorted(p.name for p in dest.parent.iterdir()) == ["job", "job.tar"]
