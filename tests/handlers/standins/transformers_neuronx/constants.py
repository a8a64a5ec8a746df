"""Layout and GQA names, with the string values the real library accepts."""

import enum


class Layout(enum.Enum):
    HSB = "HSB"
    BSH = "BSH"
    SBH = "SBH"

    def __eq__(self, other):
        # As in the real library, a layout compares equal to its string value.
        return super().__eq__(Layout(other.value if isinstance(other, Layout) else other))

    def __hash__(self):
        return hash(self.value)


class GQA(enum.Enum):
    SHARD_OVER_HEADS = "shard-over-heads"
    SHARD_OVER_BATCH = "shard-over-batch"
    REPLICATED_HEADS = "replicated-heads"
    ALL_GATHER_HEADS = "all-gather-heads"


LAYOUT_BSH, LAYOUT_HSB, LAYOUT_SBH = "BSH", "HSB", "SBH"
