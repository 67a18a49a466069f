// The stop request a signal makes (SIGTERM, SIGINT, SIGUSR1: the trainer's signal thread records it), read
// by code that runs long before the training loop can look: hashing and tokenizing the data. A
// SIGTERM while a 50 GB file was hashed (or /dev/zero was) was only seen after it.
#pragma once
#include <string>

namespace llmt {

// Records that `sig` asked the process to stop (0 clears it).
void set_stop_signal(int sig);
// The signal that asked to stop, 0 when none.
int stop_signal();
// Whether the signal asks to stop at once (SIGTERM, SIGINT). SIGUSR1 (Slurm's warning before the
// time limit) asks for a checkpoint at the next step: data preparation goes on, and a run stopped
// before its first step exits 0 with nothing saved (Trainer::run).
bool stop_now();
// Throws llmt::Error "stopped by SIGTERM while <doing>" when stop_now(); a cheap atomic load
// otherwise, fine in a loop.
void throw_if_stopped(const std::string& doing);

}  // namespace llmt
