"""The study layer: study files (`spec`), scenarios (`scenario`), results folders and runs
(`results`), summaries (`summary`), figures (`plots`) and the command line (`cli`)."""
