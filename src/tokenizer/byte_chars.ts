// GPT-2's bytes_to_unicode: the character each byte stands for in byte-level
// BPE vocabularies (vocab.json, tokenizer.json, GGUF token strings), so that
// every token is a printable string. Printable bytes stand for themselves,
// the rest for U+0100 onwards in byte order.

/** The character of each byte 0..255. */
export const BYTE_CHARS: readonly string[] = (() => {
  const printable = (b: number) => (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
  const out: string[] = [];
  let n = 0;
  for (let b = 0; b < 256; b++) out.push(String.fromCharCode(printable(b) ? b : 256 + n++));
  return out;
})();
