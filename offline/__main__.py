"""``python -m offline --stack p5 --out out/p5``: the offline plan of a stack file."""

from offline.plan import main

main()
