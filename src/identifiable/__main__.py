from identifiable.cli import main

main()
