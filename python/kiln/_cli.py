"""The `kiln` command installed with the package: runs the binary shipped inside it."""
import os
import sys


def main():
    binary = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin", "kiln")
    os.execv(binary, [binary, *sys.argv[1:]])


if __name__ == "__main__":
    main()
