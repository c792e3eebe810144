"""``kayos ctl``: looking at and operating a running cluster. ``main.py`` holds the group and
adds the commands of its neighbours; each command module does the fetching and the printing,
while what the answers mean is decided by the pure ``*_view.py`` modules (tested on canned
answers). ``common.py`` and ``options.py`` are what the commands share."""
