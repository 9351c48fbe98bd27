"""Structure-aware wire fuzzing of a real broker process (``wire_cases`` builds and mutates
request frames, ``wire_campaign`` sends them and watches the broker)."""
