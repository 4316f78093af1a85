"""The google-research/bert `create_pretraining_data.py` functions, transcribed as the oracle for our data tests.

Kept as in the original (token strings, `rng = random.Random(seed)`, `vocab_words` ordered by id), minus
TensorFlow; `do_whole_word_mask` is a parameter instead of a flag. Not imported by the package.
"""
import collections


class TrainingInstance:
  def __init__(self, tokens, segment_ids, masked_lm_positions, masked_lm_labels, is_random_next):
    self.tokens = tokens
    self.segment_ids = segment_ids
    self.is_random_next = is_random_next
    self.masked_lm_positions = masked_lm_positions
    self.masked_lm_labels = masked_lm_labels


def create_training_instances_from_tokens(all_documents, vocab_words, max_seq_length, dupe_factor, short_seq_prob,
                                          masked_lm_prob, max_predictions_per_seq, rng, do_whole_word_mask=False):
  all_documents = [x for x in all_documents if x]
  rng.shuffle(all_documents)
  instances = []
  for _ in range(dupe_factor):
    for document_index in range(len(all_documents)):
      instances.extend(create_instances_from_document(
          all_documents, document_index, max_seq_length, short_seq_prob, masked_lm_prob, max_predictions_per_seq,
          vocab_words, rng, do_whole_word_mask))
  rng.shuffle(instances)
  return instances


def create_instances_from_document(all_documents, document_index, max_seq_length, short_seq_prob, masked_lm_prob,
                                   max_predictions_per_seq, vocab_words, rng, do_whole_word_mask):
  document = all_documents[document_index]
  max_num_tokens = max_seq_length - 3
  target_seq_length = max_num_tokens
  if rng.random() < short_seq_prob:
    target_seq_length = rng.randint(2, max_num_tokens)
  instances = []
  current_chunk = []
  current_length = 0
  i = 0
  while i < len(document):
    segment = document[i]
    current_chunk.append(segment)
    current_length += len(segment)
    if i == len(document) - 1 or current_length >= target_seq_length:
      if current_chunk:
        a_end = 1
        if len(current_chunk) >= 2:
          a_end = rng.randint(1, len(current_chunk) - 1)
        tokens_a = []
        for j in range(a_end):
          tokens_a.extend(current_chunk[j])
        tokens_b = []
        is_random_next = False
        if len(current_chunk) == 1 or rng.random() < 0.5:
          is_random_next = True
          target_b_length = target_seq_length - len(tokens_a)
          for _ in range(10):
            random_document_index = rng.randint(0, len(all_documents) - 1)
            if random_document_index != document_index:
              break
          random_document = all_documents[random_document_index]
          random_start = rng.randint(0, len(random_document) - 1)
          for j in range(random_start, len(random_document)):
            tokens_b.extend(random_document[j])
            if len(tokens_b) >= target_b_length:
              break
          num_unused_segments = len(current_chunk) - a_end
          i -= num_unused_segments
        else:
          is_random_next = False
          for j in range(a_end, len(current_chunk)):
            tokens_b.extend(current_chunk[j])
        truncate_seq_pair(tokens_a, tokens_b, max_num_tokens, rng)
        assert len(tokens_a) >= 1
        assert len(tokens_b) >= 1
        tokens = []
        segment_ids = []
        tokens.append("[CLS]")
        segment_ids.append(0)
        for token in tokens_a:
          tokens.append(token)
          segment_ids.append(0)
        tokens.append("[SEP]")
        segment_ids.append(0)
        for token in tokens_b:
          tokens.append(token)
          segment_ids.append(1)
        tokens.append("[SEP]")
        segment_ids.append(1)
        (tokens, masked_lm_positions, masked_lm_labels) = create_masked_lm_predictions(
            tokens, masked_lm_prob, max_predictions_per_seq, vocab_words, rng, do_whole_word_mask)
        instances.append(TrainingInstance(tokens, segment_ids, masked_lm_positions, masked_lm_labels,
                                          is_random_next))
      current_chunk = []
      current_length = 0
    i += 1
  return instances


MaskedLmInstance = collections.namedtuple("MaskedLmInstance", ["index", "label"])


def create_masked_lm_predictions(tokens, masked_lm_prob, max_predictions_per_seq, vocab_words, rng,
                                 do_whole_word_mask):
  cand_indexes = []
  for (i, token) in enumerate(tokens):
    if token == "[CLS]" or token == "[SEP]":
      continue
    if do_whole_word_mask and len(cand_indexes) >= 1 and token.startswith("##"):
      cand_indexes[-1].append(i)
    else:
      cand_indexes.append([i])
  rng.shuffle(cand_indexes)
  output_tokens = list(tokens)
  num_to_predict = min(max_predictions_per_seq, max(1, int(round(len(tokens) * masked_lm_prob))))
  masked_lms = []
  covered_indexes = set()
  for index_set in cand_indexes:
    if len(masked_lms) >= num_to_predict:
      break
    if len(masked_lms) + len(index_set) > num_to_predict:
      continue
    is_any_index_covered = False
    for index in index_set:
      if index in covered_indexes:
        is_any_index_covered = True
        break
    if is_any_index_covered:
      continue
    for index in index_set:
      covered_indexes.add(index)
      masked_token = None
      if rng.random() < 0.8:
        masked_token = "[MASK]"
      else:
        if rng.random() < 0.5:
          masked_token = tokens[index]
        else:
          masked_token = vocab_words[rng.randint(0, len(vocab_words) - 1)]
      output_tokens[index] = masked_token
      masked_lms.append(MaskedLmInstance(index=index, label=tokens[index]))
  assert len(masked_lms) <= num_to_predict
  masked_lms = sorted(masked_lms, key=lambda x: x.index)
  masked_lm_positions = []
  masked_lm_labels = []
  for p in masked_lms:
    masked_lm_positions.append(p.index)
    masked_lm_labels.append(p.label)
  return (output_tokens, masked_lm_positions, masked_lm_labels)


def truncate_seq_pair(tokens_a, tokens_b, max_num_tokens, rng):
  while True:
    total_length = len(tokens_a) + len(tokens_b)
    if total_length <= max_num_tokens:
      break
    trunc_tokens = tokens_a if len(tokens_a) > len(tokens_b) else tokens_b
    assert len(trunc_tokens) >= 1
    if rng.random() < 0.5:
      del trunc_tokens[0]
    else:
      trunc_tokens.pop()
