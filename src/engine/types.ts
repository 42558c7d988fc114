// The engine's contract with everything above it (scheduler, HTTP). No FFI
// pointers cross this line; no HTTP objects cross it the other way.

export interface ModelInfo {
  arch: string; // "looped-llama"
  dim: number;
  nHeads: number;
  nKvHeads: number;
  headDim: number;
  ffnDim: number;
  vocabSize: number;
  defaultLoops: number;
  maxSeqLen: number;
  quant: "fp16" | "int4" | "int2";
  groupSize: number;
  tiedOutput: boolean;
  simd: string; // SIMD path in use: "portable" | "avx2" | "avx512"
  threads: number;
}

export interface SamplingParams {
  temperature: number; // 0 = greedy
  topK: number; // 0 = off
  topP: number; // 1 = off
  repetitionPenalty: number; // 1 = off
  seed: number; // non-negative integer
}

export interface GenerateRequest {
  promptTokens: number[];
  maxTokens: number;
  loops: number;
  sampling: SamplingParams;
  stopTokenIds: number[]; // generation ends (finish "stop") when one is sampled; it is not emitted
  cacheWindow: number; // 0 = full
}

export type FinishReason = "stop" | "length" | "cancelled";

export interface GenerateResult {
  tokens: number[]; // generated ids only, stop token excluded
  finishReason: FinishReason;
  promptTokens: number;
  wallMs: number; // engine start of this request to its end
  firstTokenMs: number; // engine start to the first sampled token
}

// Called once per generated token, in order. Returning false stops generation
// after this token (used for stop strings and client disconnects).
export type TokenSink = (tokenId: number) => boolean | void;
