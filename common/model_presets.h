/* model_presets: the named model shapes, in one place for the trainer (gpt.c builds its
 * configs from them) and the operator (which computes a SwarmJob's layer split and checks
 * its sequence length without linking the trainer).
 *
 * X(name, layers, width, heads, context)
 *   tiny    ~0.84M parameters: the model of fast tests and the learning test
 *   small   ~10.8M parameters: the shape of llm.c's CPU comparison point
 *   medium  ~25.5M parameters: the largest that still trains usefully on 2 cores
 * The CRD's CEL rule on data.sequenceLength repeats the contexts (YAML cannot include this).
 */
#ifndef CIRRUS_MODEL_PRESETS_H
#define CIRRUS_MODEL_PRESETS_H

#define CIRRUS_MODEL_PRESETS(X)  \
    X(tiny, 4, 128, 4, 128)      \
    X(small, 6, 384, 6, 256)     \
    X(medium, 8, 512, 8, 256)

#endif
