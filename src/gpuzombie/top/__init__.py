"""`gpuzombie top`: a live, pod-aware view of a GPU node (the model needs no Textual; the app does)."""
