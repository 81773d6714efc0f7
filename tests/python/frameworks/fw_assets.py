"""Small, generated inputs for the framework tests: a text corpus and a BPE
tokenizer trained on it (torchtitan's Llama debug model wants a Hugging Face
tokenizer directory and a `load_dataset` directory; the wheel ships neither:
they live in torchtitan's git tests/assets). Deterministic: the same files on
every machine, so a run's losses depend only on the training itself."""
import json
import os
import random

WORDS = ("the of and to in is was for on that with as by at from his her an were are "
         "which this be or had it not but first one their its new after who they have two "
         "been has more other time during when all into years also there would up over "
         "only city out between many most some later these about she where under can school "
         "world under state team than made while three used both through film season war "
         "group part well may then known people game end being album including second")


def corpus(n_docs=400, seed=1234):
    rng = random.Random(seed)
    words = WORDS.split()
    docs = []
    for _ in range(n_docs):
        sentences = []
        for _ in range(rng.randint(3, 8)):
            s = " ".join(rng.choice(words) for _ in range(rng.randint(5, 16)))
            sentences.append(s.capitalize() + ".")
        docs.append(" ".join(sentences))
    return docs


def make_assets(root, vocab_size=2048):
    """Writes root/dataset/train.jsonl and root/tokenizer/{tokenizer,tokenizer_config}.json;
    returns (dataset_dir, tokenizer_dir)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers, decoders
    docs = corpus()
    data_dir = os.path.join(root, "dataset")
    tok_dir = os.path.join(root, "tokenizer")
    os.makedirs(data_dir, exist_ok=True)
    os.makedirs(tok_dir, exist_ok=True)
    with open(os.path.join(data_dir, "train.jsonl"), "w") as f:
        for d in docs:
            f.write(json.dumps({"text": d}) + "\n")
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False,
                                  special_tokens=["<unk>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(docs, trainer)
    tok.save(os.path.join(tok_dir, "tokenizer.json"))
    with open(os.path.join(tok_dir, "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": "<s>", "eos_token": "</s>", "add_bos_token": True,
                   "add_eos_token": True, "unk_token": "<unk>"}, f)
    return data_dir, tok_dir


if __name__ == "__main__":
    import sys
    print(make_assets(sys.argv[1]))
