import sys

from scrapy_suite.run import main

sys.exit(main())
