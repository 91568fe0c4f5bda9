;; Chained 64-bit block hashes over uint32 words (token ids, or text bytes 4 at a time).
;; Assembled by scripts/build-wasm.mjs into block-hash-wasm.ts; see src/core/hashing.ts.
;;
;; Per block of `bs` words: a local hash in the manner of xxHash64 (four independent 64-bit
;; lanes over 8-byte stripes, merged and avalanched), then the sequence hash
;;   seq = avalanche(rotl(parent * P1, 31) * P2 ^ local)
;; which is a bijection in the parent for a fixed block and in the block for a fixed parent.
;; The xxHash64 round, rotl(acc + input * P2, 31) * P1, and the avalanche are written out
;; inline: the engine's baseline compiler does not inline small functions.
(module
  (memory (export "memory") 2)

  ;; hash_blocks(words_ptr, n_words, bs, seed_hi, seed_lo, out_lo_ptr, out_hi_ptr) -> blocks written
  ;; out: each block's low 32 bits at out_lo_ptr, its high 32 bits at out_hi_ptr (one u32 per
  ;; block each), the layout of BlockHashes' lo and hi arrays, so the caller copies two runs
  (func (export "hash_blocks")
    (param $words i32) (param $n i32) (param $bs i32) (param $shi i32) (param $slo i32) (param $out_lo i32)
    (param $out_hi i32)
    (result i32)
    (local $nb i32) (local $b i32) (local $p i32) (local $end i32) (local $stripes_end i32)
    (local $parent i64) (local $a1 i64) (local $a2 i64) (local $a3 i64) (local $a4 i64) (local $h i64)
    (local.set $nb (i32.div_u (local.get $n) (local.get $bs)))
    (local.set $parent
      (i64.or (i64.shl (i64.extend_i32_u (local.get $shi)) (i64.const 32)) (i64.extend_i32_u (local.get $slo))))
    (local.set $p (local.get $words))
    (block $done
      (loop $blocks
        (br_if $done (i32.ge_u (local.get $b) (local.get $nb)))
        (local.set $end (i32.add (local.get $p) (i32.shl (local.get $bs) (i32.const 2))))
        (local.set $a1 (i64.const 0x60EA27EEADC0B5D6))
        (local.set $a2 (i64.const 0xC2B2AE3D27D4EB4F))
        (local.set $a3 (i64.const 0))
        (local.set $a4 (i64.const 0x61C8864E7A143579))
        ;; 32-byte stripes (8 words), one 8-byte lane each
        (local.set $stripes_end (i32.sub (local.get $end) (i32.const 31)))
        (block $stripes_done
          (loop $stripes
            (br_if $stripes_done (i32.ge_s (local.get $p) (local.get $stripes_end)))
            (local.set $a1 (i64.mul (i64.rotl (i64.add (local.get $a1) (i64.mul (i64.load (local.get $p)) (i64.const 0xC2B2AE3D27D4EB4F))) (i64.const 31)) (i64.const 0x9E3779B185EBCA87)))
            (local.set $a2 (i64.mul (i64.rotl (i64.add (local.get $a2) (i64.mul (i64.load offset=8 (local.get $p)) (i64.const 0xC2B2AE3D27D4EB4F))) (i64.const 31)) (i64.const 0x9E3779B185EBCA87)))
            (local.set $a3 (i64.mul (i64.rotl (i64.add (local.get $a3) (i64.mul (i64.load offset=16 (local.get $p)) (i64.const 0xC2B2AE3D27D4EB4F))) (i64.const 31)) (i64.const 0x9E3779B185EBCA87)))
            (local.set $a4 (i64.mul (i64.rotl (i64.add (local.get $a4) (i64.mul (i64.load offset=24 (local.get $p)) (i64.const 0xC2B2AE3D27D4EB4F))) (i64.const 31)) (i64.const 0x9E3779B185EBCA87)))
            (local.set $p (i32.add (local.get $p) (i32.const 32)))
            (br $stripes)))
        (local.set $h
          (i64.add
            (i64.add (i64.rotl (local.get $a1) (i64.const 1)) (i64.rotl (local.get $a2) (i64.const 7)))
            (i64.add (i64.rotl (local.get $a3) (i64.const 12)) (i64.rotl (local.get $a4) (i64.const 18)))))
        ;; the tail: whole 8-byte words, then a last 4-byte word
        (block $tail8_done
          (loop $tail8
            (br_if $tail8_done (i32.gt_s (i32.add (local.get $p) (i32.const 8)) (local.get $end)))
            (local.set $h
              (i64.add
                (i64.mul (i64.rotl (i64.xor (local.get $h) (i64.mul (i64.rotl (i64.add (i64.const 0) (i64.mul (i64.load (local.get $p)) (i64.const 0xC2B2AE3D27D4EB4F))) (i64.const 31)) (i64.const 0x9E3779B185EBCA87))) (i64.const 27))
                         (i64.const 0x9E3779B185EBCA87))
                (i64.const 0x85EBCA77C2B2AE63)))
            (local.set $p (i32.add (local.get $p) (i32.const 8)))
            (br $tail8)))
        (if (i32.lt_u (local.get $p) (local.get $end))
          (then
            (local.set $h
              (i64.add
                (i64.mul (i64.rotl (i64.xor (local.get $h) (i64.mul (i64.load32_u (local.get $p)) (i64.const 0x9E3779B185EBCA87)))
                                   (i64.const 23))
                         (i64.const 0xC2B2AE3D27D4EB4F))
                (i64.const 0x165667B19E3779F9)))
            (local.set $p (i32.add (local.get $p) (i32.const 4)))))
        (local.set $h (i64.xor (local.get $h) (i64.extend_i32_u (local.get $bs))))
        (local.set $h (i64.xor (local.get $h) (i64.shr_u (local.get $h) (i64.const 33))))
        (local.set $h (i64.mul (local.get $h) (i64.const 0xC2B2AE3D27D4EB4F)))
        (local.set $h (i64.xor (local.get $h) (i64.shr_u (local.get $h) (i64.const 29))))
        (local.set $h (i64.mul (local.get $h) (i64.const 0x165667B19E3779F9)))
        (local.set $h (i64.xor (local.get $h) (i64.shr_u (local.get $h) (i64.const 32))))
        ;; chain to the parent
        (local.set $parent
          (i64.xor
            (i64.mul (i64.rotl (i64.mul (local.get $parent) (i64.const 0x9E3779B185EBCA87)) (i64.const 31))
                     (i64.const 0xC2B2AE3D27D4EB4F))
            (local.get $h)))
        (local.set $parent (i64.xor (local.get $parent) (i64.shr_u (local.get $parent) (i64.const 33))))
        (local.set $parent (i64.mul (local.get $parent) (i64.const 0xC2B2AE3D27D4EB4F)))
        (local.set $parent (i64.xor (local.get $parent) (i64.shr_u (local.get $parent) (i64.const 29))))
        (local.set $parent (i64.mul (local.get $parent) (i64.const 0x165667B19E3779F9)))
        (local.set $parent (i64.xor (local.get $parent) (i64.shr_u (local.get $parent) (i64.const 32))))
        (i32.store (i32.add (local.get $out_lo) (i32.shl (local.get $b) (i32.const 2))) (i32.wrap_i64 (local.get $parent)))
        (i32.store (i32.add (local.get $out_hi) (i32.shl (local.get $b) (i32.const 2)))
                   (i32.wrap_i64 (i64.shr_u (local.get $parent) (i64.const 32))))
        (local.set $b (i32.add (local.get $b) (i32.const 1)))
        (br $blocks)))
    (local.get $nb))
)
