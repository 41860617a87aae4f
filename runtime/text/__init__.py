"""Text in and out: the tokenizer and chat template (`codec`, `template/`), a prompt's checks
(`checks`), tool-call markup (`tools`), a thinking model's reasoning (`reasoning`), fill-in-the-
middle prompts (`fim`)."""
