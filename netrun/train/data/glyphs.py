"""Stroke templates of the digits 0-9 for the generated dataset, as evenly spaced points.

A glyph lives in a unit box: x grows to the right, y grows downwards, both in [0, 1].
Each digit has a few variants (open and closed 4, 7 with and without a crossbar, ...), so
that a class is not a single shape. Each template is resampled to `POINTS` points spaced
evenly along its total stroke length, so that every stroke gets the same ink density.
"""
from __future__ import annotations

import numpy as np

POINTS = 96          # points per template; spacing stays below ~1.5 px at 28x28


def _line(x0: float, y0: float, x1: float, y1: float) -> np.ndarray:
    t = np.linspace(0.0, 1.0, 64)[:, None]
    return (1 - t) * np.array([x0, y0]) + t * np.array([x1, y1])


def _arc(cx: float, cy: float, rx: float, ry: float, t0: float, t1: float) -> np.ndarray:
    # Angles in degrees, counter-clockwise on screen (y points down, hence the minus sign).
    t = np.radians(np.linspace(t0, t1, 256))
    return np.stack([cx + rx * np.cos(t), cy - ry * np.sin(t)], axis=1)


def _variants() -> list[list[list[np.ndarray]]]:
    """The strokes of every variant of every digit, indexed [digit][variant][stroke]."""
    return [
        [[_arc(0.5, 0.5, 0.5, 0.5, 90, 450)],
         [_arc(0.5, 0.5, 0.36, 0.5, 100, 460)]],
        [[_line(0.5, 0.0, 0.5, 1.0)],
         [_line(0.22, 0.25, 0.5, 0.0), _line(0.5, 0.0, 0.5, 1.0)],
         [_line(0.22, 0.25, 0.5, 0.0), _line(0.5, 0.0, 0.5, 1.0), _line(0.22, 1.0, 0.78, 1.0)]],
        [[_arc(0.5, 0.3, 0.45, 0.3, 160, -35), _line(0.869, 0.472, 0.02, 1.0),
          _line(0.02, 1.0, 1.0, 1.0)],
         [_arc(0.5, 0.28, 0.42, 0.28, 170, 0), _line(0.92, 0.28, 0.0, 1.0),
          _line(0.0, 1.0, 1.0, 0.97)]],
        [[_arc(0.5, 0.25, 0.42, 0.25, 150, -90), _arc(0.5, 0.75, 0.47, 0.25, 90, -150)],
         [_line(0.05, 0.0, 0.9, 0.0), _line(0.9, 0.0, 0.4, 0.4),
          _arc(0.45, 0.7, 0.5, 0.3, 95, -150)]],
        [[_line(0.7, 0.0, 0.0, 0.68), _line(0.0, 0.68, 1.0, 0.68), _line(0.72, 0.0, 0.72, 1.0)],
         [_line(0.12, 0.0, 0.05, 0.62), _line(0.05, 0.62, 1.0, 0.62),
          _line(0.75, 0.1, 0.75, 1.0)]],
        [[_line(0.9, 0.0, 0.22, 0.0), _line(0.22, 0.0, 0.25, 0.44),
          _arc(0.48, 0.7, 0.42, 0.3, 120, -145)]],
        [[_arc(0.8, 0.62, 0.7, 0.62, 90, 180), _arc(0.5, 0.7, 0.4, 0.3, 180, -180)]],
        [[_line(0.0, 0.0, 1.0, 0.0), _line(1.0, 0.0, 0.35, 1.0)],
         [_line(0.0, 0.0, 1.0, 0.0), _line(1.0, 0.0, 0.35, 1.0), _line(0.4, 0.52, 0.9, 0.52)],
         [_line(0.0, 0.18, 0.0, 0.0), _line(0.0, 0.0, 1.0, 0.0), _line(1.0, 0.0, 0.4, 1.0)]],
        [[_arc(0.5, 0.25, 0.34, 0.25, 90, 450), _arc(0.5, 0.74, 0.42, 0.26, 90, 450)]],
        [[_arc(0.5, 0.3, 0.4, 0.3, 0, 360), _line(0.9, 0.3, 0.85, 1.0)],
         [_arc(0.5, 0.3, 0.4, 0.3, 0, 360), _arc(0.3, 0.3, 0.6, 0.7, 0, -90)]],
    ]


def _resample(strokes: list[np.ndarray], count: int) -> np.ndarray:
    """`count` points evenly spaced along all strokes together: (count, 2)."""
    lengths = [np.concatenate([[0.0], np.cumsum(np.hypot(*np.diff(s, axis=0).T))])
               for s in strokes]
    total = sum(float(c[-1]) for c in lengths)
    # Midpoints of `count` equal steps, so no point sits exactly on a stroke end twice.
    targets = (np.arange(count) + 0.5) * (total / count)
    points, start = [], 0.0
    for stroke, cum in zip(strokes, lengths):
        local = targets[(targets >= start) & (targets < start + cum[-1])] - start
        points.append(np.stack([np.interp(local, cum, stroke[:, k]) for k in (0, 1)], axis=1))
        start += float(cum[-1])
    return np.concatenate(points)[:count]


def build_templates(count: int = POINTS) -> tuple[np.ndarray, np.ndarray]:
    """(points (T, count, 2) in the unit box, digit of each template (T,))."""
    points, digit = [], []
    for d, variants in enumerate(_variants()):
        for strokes in variants:
            points.append(_resample(strokes, count))
            digit.append(d)
    return np.stack(points), np.array(digit)
