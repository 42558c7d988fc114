// The engine's errors, apart from the engine itself so that the layers
// above (HTTP error mapping) and the engine's own helpers can name them
// without importing the FFI binding.

/** The model or kernel library cannot be loaded (start-up). */
export class EngineLoadError extends Error {}

/** A request the engine refuses (bad token id, loops beyond the model...): `param` names the request field when one is to blame. */
export class EngineRequestError extends Error {
  constructor(
    message: string,
    readonly param: string | null = null,
    readonly code: string | null = null,
  ) {
    super(message);
  }
}
