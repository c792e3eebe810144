"""``kayos ctl status``'s pure part: the nodes' half (view.py), the manager's half
(manager.py) and what they share (common.py)."""
