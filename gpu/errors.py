"""The one error every kind's parameters raise (pencil options and the four batch jobs)."""

from __future__ import annotations


class ParamError(ValueError):
    """A parameter is missing, has the wrong type, is out of range or not one of its choices.

    `field`: the parameter as a client spells it ("method", "patterns[2]", "model.velocity").
    `code`: the API's error code: invalid_parameter unless a more precise one applies
    (cfl_violation, source_outside_grid, invalid_model, invalid_matrix, ...).
    """

    def __init__(self, field: str, message: str, code: str = "invalid_parameter"):
        super().__init__(f"{field}: {message}")
        self.field, self.code = field, code
