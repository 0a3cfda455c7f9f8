// Generic `dq_chunk` for types without a register dequantizer: `dequant_chunk` fills `wq`, whose
// values are then read with constant indices into a `Chunk`.

fn dq_chunk(block: u32, sub: u32) -> Chunk {
    dequant_chunk(block, sub);
    return Chunk(vec4<f32>(wq[0], wq[1], wq[2], wq[3]), vec4<f32>(wq[4], wq[5], wq[6], wq[7]),
                 vec4<f32>(wq[8], wq[9], wq[10], wq[11]), vec4<f32>(wq[12], wq[13], wq[14], wq[15]),
                 vec4<f32>(wq[16], wq[17], wq[18], wq[19]), vec4<f32>(wq[20], wq[21], wq[22], wq[23]),
                 vec4<f32>(wq[24], wq[25], wq[26], wq[27]), vec4<f32>(wq[28], wq[29], wq[30], wq[31]));
}
