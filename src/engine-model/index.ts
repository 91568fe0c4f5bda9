/**
 * The model of one inference engine shared by the simulator and the mock engine. Import it
 * from here, not from the files behind it.
 */
export { BlockPool } from './block-pool.js';
export { ENGINE_DEFAULTS, engineConfig, type EngineConfig } from './config.js';
export { EngineModel } from './engine-model.js';
export { KeySlotTable } from './key-slot-table.js';
export { MAX_KV_BLOCKS, rejection, type EngineLimits } from './limits.js';
export { blockKey, type EngineAnchor, type EngineRequest, type StepResult } from './request.js';
export { stepTime } from './step-time.js';
