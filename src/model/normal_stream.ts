// Deterministic normal draws for generated weights (synthetic models, test
// checkpoints): one stream per (seed, tensor name), the same values on
// every machine.

// ---- PRNG: splitmix64 for seeding, xoshiro128** for the stream ----

const MASK64 = (1n << 64n) - 1n;

function splitmix64(state: bigint): [bigint, bigint] {
  const s = (state + 0x9e3779b97f4a7c15n) & MASK64;
  let z = s;
  z = ((z ^ (z >> 30n)) * 0xbf58476d1ce4e5b9n) & MASK64;
  z = ((z ^ (z >> 27n)) * 0x94d049bb133111ebn) & MASK64;
  return [s, z ^ (z >> 31n)];
}

/** FNV-1a over the UTF-16 code units of a (pure ASCII) tensor name. */
function fnv1a32(s: string): number {
  let h = 0x811c9dc5;
  for (let i = 0; i < s.length; i++) h = Math.imul(h ^ s.charCodeAt(i), 0x01000193) >>> 0;
  return h;
}

/** The four 32-bit words of a xoshiro128** state for (seed, stream name). */
export function streamState(seed: number, stream: string): Uint32Array {
  // Hash the seed first so that no (seed, name) pair aliases another's stream.
  let st = splitmix64(BigInt(seed))[1] ^ BigInt(fnv1a32(stream));
  const out = new Uint32Array(4);
  for (let i = 0; i < 4; i += 2) {
    let z: bigint;
    [st, z] = splitmix64(st);
    out[i] = Number(z & 0xffffffffn);
    out[i + 1] = Number(z >> 32n);
  }
  return out;
}

// Irwin-Hall: the sum of four uniform 16-bit integers has mean 2 * 65535 and
// variance 4 * (65536^2 - 1) / 12; centring and scaling gives unit variance,
// support +-3.46 sigma.
const IH_MEAN = 2 * 65535;
const IH_INV_STD = 1 / Math.sqrt((65536 * 65536 - 1) / 3);

/**
 * Fills out[i] = mean + std * N(0,1) from the stream, advancing the state.
 * The generator is inlined over locals: this loop writes 10^8 values for a
 * dim-768 model.
 */
export function fillNormal(out: Float32Array, mean: number, std: number, s: Uint32Array): void {
  let s0 = s[0] | 0;
  let s1 = s[1] | 0;
  let s2 = s[2] | 0;
  let s3 = s[3] | 0;
  const scale = std * IH_INV_STD;
  for (let i = 0; i < out.length; i++) {
    // xoshiro128**, twice: four 16-bit uniforms (integer sums, exact in any order)
    let sum = 0;
    for (let k = 0; k < 2; k++) {
      let r = Math.imul(s1, 5);
      r = Math.imul((r << 7) | (r >>> 25), 9) >>> 0;
      const t = s1 << 9;
      s2 ^= s0;
      s3 ^= s1;
      s1 ^= s2;
      s0 ^= s3;
      s2 ^= t;
      s3 = (s3 << 11) | (s3 >>> 21);
      sum += (r & 0xffff) + (r >>> 16);
    }
    out[i] = mean + (sum - IH_MEAN) * scale;
  }
  s[0] = s0;
  s[1] = s1;
  s[2] = s2;
  s[3] = s3;
}
