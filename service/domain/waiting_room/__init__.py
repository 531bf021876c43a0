"""A product's waiting room: joining and polling, the pre-queue's lottery and its record
(docs/ARCHITECTURE.md, "Waiting room")."""
