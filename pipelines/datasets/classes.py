"""The road-distress classes, in class-id order (id 0 is the background): the synthetic generator's annotations and
the road-distress models' heads (model_export) both use this list."""

ROAD_DISTRESS_CLASSES = ("pothole", "crack", "patch", "puddle")
