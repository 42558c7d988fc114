// The scheduler package's public surface (see scheduler.ts for the flow).
export { createRequest, InvalidTransitionError, RequestRecord, type RequestState, TERMINAL_STATES, transition } from "./lifecycle.ts";
export { type CostSample, LatencyPredictor, type Work } from "./predictor.ts";
export { type PrefixHit, PrefixPool, type Snapshot } from "./prefix_pool.ts";
export { QueueFullError, RequestQueue } from "./queue.ts";
export {
  type EngineRunOptions,
  type RejectionReason,
  Scheduler,
  type SchedulerEngine,
  SchedulerRejection,
  type SchedulerOptions,
  type SubmitOptions,
  type Ticket,
} from "./scheduler.ts";
