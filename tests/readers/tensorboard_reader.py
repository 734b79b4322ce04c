"""Read a TensorBoard log directory back: every scalar in every event file, and the params table."""

from __future__ import annotations

from pathlib import Path

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from . import ReadBack

PARAMS_TAG = "hyperparameters"


def read_tensorboard_dir(logdir: str | Path) -> ReadBack:
    """All scalar points of all event files in ``logdir`` (file by file, duplicates kept) and params."""
    back = ReadBack()
    for path in sorted(Path(logdir).glob("events.out.tfevents.*")):
        # One accumulator per file, keeping every point (size 0 = no sampling) and no purging,
        # so a step written twice across a restart shows up twice.
        acc = EventAccumulator(str(path), size_guidance={"scalars": 0, "tensors": 0}, purge_orphaned_data=False)
        acc.Reload()
        tags = acc.Tags()
        for tag in tags["scalars"]:
            back.points += [(event.step, tag, event.value) for event in acc.Scalars(tag)]
        if PARAMS_TAG in tags["tensors"]:
            for event in acc.Tensors(PARAMS_TAG):
                back.params.update(parse_params_table(event.tensor_proto.string_val[0].decode()))
    back.points.sort(key=lambda point: point[0])  # stable: storage order kept within a step
    return back


def parse_params_table(markdown: str) -> dict[str, str]:
    """The markdown table the sink writes -> {flattened key: value as text}."""
    params = {}
    for line in markdown.splitlines()[2:]:  # after the header and the |---| line
        cells = _cells(line)
        if len(cells) == 2:
            params[cells[0]] = cells[1]
    return params


def _cells(line: str) -> list[str]:
    """Split a row on unescaped pipes and undo the escapes: ``| a | b\\|c |`` -> ["a", "b|c"]."""
    cells, cell, chars = [], [], iter(line)
    for char in chars:
        if char == "\\":
            cell.append(next(chars, ""))
        elif char == "|":
            cells.append("".join(cell))
            cell = []
        else:
            cell.append(char)
    return [cell[1:-1] for cell in cells[1:]]  # drop the padding space each side
