"""The memory estimate (`trainwise estimate`): shapes, the measured activation probe, the peak, the data's facts, and a
study's plans priced by it."""
