from docker_variant.cli import main

main()
