from traceforge.cli import main

main()
