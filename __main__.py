from components.stack import main

main()
