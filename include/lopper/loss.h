// What a model is trained and judged on: the loss on its first output, chosen by name or from the
// data and the output's shape. Shared by every command that feeds data (train, finetune, eval,
// gradient criteria, sensitivity, targets with data).
//
//   cross-entropy         classifier output [B, C] (or [B, ...], flattened) and labels [B]:
//                         images, sequence classification
//   mse                   the same output against one-hot labels
//   causal-lm             next-token prediction: logits [B, T, V] at position t against the token
//                         at t + 1 (the labels when the data has them, else the input IDs);
//                         positions whose attention mask is 0 and labels of -100 are not counted
//   masked-lm             BERT's objective: a share of the tokens (mask_prob) is picked, 80% of
//                         them become mask_token, 10% a random token, 10% stay; the logits
//                         [B, T, V] predict the picked tokens only
//   token-classification  logits [B, T, C] against labels [B, T] (-100 and masked-out positions
//                         are not counted)
//   auto                  cross-entropy for labels [B], token-classification for labels [B, T]
//                         and an output [B, T, C], causal-lm for an output [B, T, V] and data
//                         without labels
#pragma once

#include <cstdint>
#include <string>

namespace lopper {

enum class Loss { kAuto, kCrossEntropy, kMse, kCausalLm, kMaskedLm, kTokenClassification };

/// "auto" | "cross-entropy" | "mse" | "causal-lm" | "masked-lm" | "token-classification"; throws
/// lopper::Error on anything else.
Loss parse_loss(const std::string& s);
const char* loss_name(Loss l);
/// The language-model losses, whose exp(loss) is the perplexity.
inline bool is_language_model(Loss l) { return l == Loss::kCausalLm || l == Loss::kMaskedLm; }

struct LossOptions {
  Loss loss = Loss::kAuto;
  int64_t mask_token = -1;  // masked-lm: the ID of the mask token ([MASK]); required
  double mask_prob = 0.15;  // masked-lm: the share of the (unmasked-by-attention) tokens picked
  uint64_t seed = 0;        // masked-lm: which tokens are picked (with the batch's position)
};

/// Throws lopper::Error naming the first option out of range (mask_token for masked-lm, mask_prob
/// outside (0, 1]).
void check_loss_options(const LossOptions& o);

}  // namespace lopper
