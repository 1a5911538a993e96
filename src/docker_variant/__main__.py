from docker_variant.entry import main

main()
