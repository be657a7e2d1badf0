// The task of `sluice train --program FILE.sluice`: a model written as a training program
// (nn/training_program.h) trained on data whose arrays its inputs bind.
//
// Data is a set of named arrays per batch, the first axis the example:
//   sort, a text file, a .bin token file   tokens i64[B, T] and next_tokens i64[B, T]
//   blobs                                 x f32[B, F] and labels i64[B] (F from the program's
//                                         input bound to x, K from --classes)
// Sizes the program names are bound before the first step: B to the micro-batch size, T to the
// data's sequence length (token data) or --seq. Every input is checked against its array (name,
// dtype, shape) when the task is made, so a program that cannot train fails before anything runs
// or is written.
//
// Failure modes: MakeProgramTask throws IoError for an unreadable file, ParseError for bad text,
// and InvalidArgument naming the file, line and input for a program the data cannot feed.
#pragma once

#include <memory>
#include <string>

#include "sluice/step/task.h"

namespace sluice {

std::unique_ptr<Task> MakeProgramTask(const TrainConfig& config);

// The data a program trains on when --data is not given: "sort" when it binds tokens or
// next_tokens, "blobs" when it binds only x and labels. Throws InvalidArgument naming the arrays
// it binds otherwise (they need --data FILE.safetensors), IoError when the file cannot be read.
std::string DefaultProgramData(const std::string& program_path);

// The training program of config.model (gpt or mlp) as `sluice export` writes it: what
// --program trains with bitwise the losses of --model. The GPT's vocabulary comes from the data.
std::string ExportBuiltinProgram(const TrainConfig& config);

}  // namespace sluice
