import sys

from harness.campaign.command import main

sys.exit(main(sys.argv[1:]))
