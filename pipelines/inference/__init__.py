"""The inference job (plan, waves), its sources (images, video segments) and the executor task."""
