"""`python -m identifiable`: the command line. Importing this module runs nothing."""

if __name__ == "__main__":
    from identifiable.cli import main

    main()
