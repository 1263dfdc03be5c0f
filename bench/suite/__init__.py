"""``python -m bench --suite full|quick`` (or ``pickleshard bench --suite ...``): every loader a
user would choose between, side by side, on the same generated data and the same DataLoader loop.

- :mod:`.plan` names the datasets, the loaders and one row (a loader on a dataset with W workers);
- :mod:`.datasets` writes the pickles; :mod:`.prepare` builds each loader's index or converted
  copy with the loader's own tool, timed; :mod:`.loaders` and :mod:`.peers` open them;
- :mod:`.child` runs one preparation or one epoch in a fresh process; :mod:`.epoch` is the loop
  and what it measures; :mod:`.report` writes the Markdown table and the plots;
  :mod:`.main` is the command line.
"""
