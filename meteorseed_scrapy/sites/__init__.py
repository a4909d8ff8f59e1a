"""Sites as rule configs: one YAML/JSON file per site, one generic spider (``scrapy crawl sites``).

- :mod:`.schema` / :mod:`.reader`: the validated config objects (:mod:`.model`) and their
  errors (fields and selectors: :mod:`.field_rules`; a value as an error shows it,
  :mod:`.shown`)
- :mod:`.format` / :mod:`.spec`: every key of the format, declared once (validator and JSON Schema)
- :mod:`.processors`, :mod:`.extract`: selecting and normalising field values (numbers and
  prices strictly, :mod:`.numbers`; natural-language dates, :mod:`.dates`)
- :mod:`.links`: the links a rule follows, with Scrapy's LinkExtractor semantics
- :mod:`.patterns`: the rules' regular expressions, matched with a time bound
- :mod:`.rulefile`: one rule file read and validated
- :mod:`.loader`: the rules directory (and, with :mod:`.remote`, the rules pushed to Redis), hot
  reload that keeps the last good version
- :mod:`.lookup`: :class:`~meteorseed_scrapy.sites.lookup.SiteConfigs`, the one site-rule lookup
  of workers, seeding and the HTTP API
- :mod:`.quality`: constraint checks, per-site anomaly rates and jump detection
- :mod:`.reposts`: content fingerprints for repost detection
- :mod:`.pipeline`: anomalies to the anomaly store, duplicates marked, items to the store stage
- :mod:`.spider`: :class:`~meteorseed_scrapy.sites.spider.RuleSpider`
- :mod:`.render` / :mod:`.browser`: ``render: browser`` sites through headless Chromium
  (scrapy-playwright), the middleware that marks their requests and the lazy handler
- :mod:`.page_cache` / :mod:`.reparse`: pages kept for ``meteorseed sites reparse``, and the
  re-parse with a site's current rules

See docs/sites.md.
"""
