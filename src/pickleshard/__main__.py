from .cli import main

# guarded: spawned processes (a Dask LocalCluster's workers) import this module again
if __name__ == "__main__":
    raise SystemExit(main())
