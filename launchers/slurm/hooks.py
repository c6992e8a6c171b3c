"""The SLURM launcher's rules on ``cluster.slurm``, what a smoke leaves untested, and the cluster-profile check."""

from __future__ import annotations

from collections.abc import Iterator

from slime.spec.plugin import Finding

__all__ = ["RULES", "WARNINGS", "seconds", "site_check", "untested"]


def seconds(limit: str) -> int:
    """SLURM --time text (already pattern-checked) in seconds."""
    days, _, rest = limit.rpartition("-")
    parts = [int(x) for x in rest.split(":")]
    if days:  # D-HH[:MM[:SS]]
        h, m, sec = (parts + [0, 0])[:3]
        return int(days) * 86400 + h * 3600 + m * 60 + sec
    if len(parts) == 1:  # MM
        return parts[0] * 60
    if len(parts) == 2:  # MM:SS
        return parts[0] * 60 + parts[1]
    return parts[0] * 3600 + parts[1] * 60 + parts[2]


def time_limit(s) -> Iterator[Finding]:
    c = s.cluster.slurm
    if c is None or c.time_limit is None:
        return
    limit = seconds(c.time_limit)
    if limit == 0:
        yield ("cluster.slurm.time_limit", f"time_limit {c.time_limit!r} is zero", "e.g. '04:00:00'")
    elif c.signal_grace_s >= limit:
        yield (
            "cluster.slurm.signal_grace_s",
            f"signal_grace_s {c.signal_grace_s} is not below the time limit "
            f"{c.time_limit!r} ({limit} s): the job would be told to checkpoint before it starts",
            "raise cluster.slurm.time_limit or lower cluster.slurm.signal_grace_s",
        )


RULES = (time_limit,)


def container_image(s) -> Iterator[Finding]:
    """An image written for the other runtime: pyxis takes 'registry#image' or .sqsh, Apptainer a .sif."""
    ct = s.cluster.slurm.container if s.cluster.slurm else None
    if ct is None:
        return
    if ct.runtime == "pyxis" and ct.image.endswith(".sif"):
        yield (
            "cluster.slurm.container.runtime",
            f"the image {ct.image!r} is an Apptainer/Singularity .sif, but runtime is pyxis",
            "set cluster.slurm.container.runtime: apptainer (or singularity)",
        )
    elif ct.runtime != "pyxis" and "#" in ct.image:
        yield (
            "cluster.slurm.container.image",
            f"{ct.image!r} is pyxis' 'registry#image' form, which {ct.runtime} does not read",
            "give a .sif path or a docker://registry/image:tag URI, or set runtime: pyxis",
        )


WARNINGS = (container_image,)


def untested(spec) -> Iterator[str]:
    yield "SLURM submission: sbatch, the allocation, requeues"


def site_check(site):
    """``slime-submit clusters check``: the profile against the cluster (``launchers.slurm.sitecheck``)."""
    from launchers.slurm.sitecheck import check_site

    return check_site(site)
