"""Pure-Python BPE tokenizer that runs a Hugging Face tokenizer.json exactly as `tokenizers` does (SentencePiece-
style BPE with byte fallback such as Mistral v0.3, and byte-level BPE such as GPT-2/Llama-3/OLMo), plus the
Mistral chat template with its loss mask. See docs/CONTRACTS.md ("Tokenizer")."""

from align.tokenizer.bpe import BpeCacheConfig
from align.tokenizer.chat import ChatEncoding
from align.tokenizer.tokenizer import MISTRAL_V03, Tokenizer, TokenizerConfig

__all__ = ["BpeCacheConfig", "ChatEncoding", "MISTRAL_V03", "Tokenizer", "TokenizerConfig"]
