// The few WebAssembly globals hashing.ts uses. Node has them; TypeScript declares them only in
// the DOM lib, which this package does not load.
declare namespace WebAssembly {
  class Module {
    constructor(bytes: Uint8Array);
  }
  class Instance {
    constructor(module: Module, imports?: object);
    readonly exports: Record<string, unknown>;
  }
  class Memory {
    readonly buffer: ArrayBuffer;
    grow(deltaPages: number): number;
  }
}
