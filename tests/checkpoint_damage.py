"""Damage one file of a checkpoint step directory, as disks and killed writers do (shared
by the checkpoint and robustness tests)."""
import os


def largest_state_file(step_dir):
    """(path, path relative to the step directory) of the biggest array data file."""
    files = [os.path.join(d, f) for d, _, fs in os.walk(step_dir / "state") for f in fs]
    path = max(files, key=os.path.getsize)
    return path, os.path.relpath(path, step_dir)


def damage(step_dir, how):
    """Damages one file of a step directory; returns the path named in the problem."""
    if how in ("truncate", "flip"):
        path, rel = largest_state_file(step_dir)
        size = os.path.getsize(path)
        with open(path, "r+b") as f:
            if how == "truncate":
                f.truncate(size // 2)
            else:
                f.seek(size // 2)
                data = f.read(16)
                f.seek(size // 2)
                f.write(bytes(b ^ 0xFF for b in data))
        assert (os.path.getsize(path) == size) == (how == "flip")
        return rel
    if how == "bad_json":
        (step_dir / "metadata" / "metadata").write_text('{"s": ')
        return "metadata/metadata"
    if how == "bad_orbax_metadata":
        (step_dir / "state" / "_METADATA").write_text("{not json")
        return "state/_METADATA"
    if how == "missing":
        path, rel = largest_state_file(step_dir)
        os.remove(path)
        return rel
    if how == "extra":
        (step_dir / "state" / "d" / "stray").write_bytes(b"x")
        return "state/d/stray"
    raise ValueError(how)
