// Seconds this process's host has spent blocked in collectives since it started: the control
// communicator's collectives (each a WatchScope) and waits on the data communicator's requests
// when the host blocks in them (MPI; NCCL's wait_host). The trainer reads it around each step to
// split the step into compute and waiting, which is how a slow rank is named (train/straggler.h):
// the slow rank computes longer and its peers wait longer. A collective NCCL runs on the GPU's
// stream is waited for on the device, not by the host: its communicator times each collective on
// its stream with events (from when this rank's inputs were ready to its end, so the wait for the
// peers is in it) and registers the sum here. Collectives on two communicators at once (a hybrid
// shard's groups) are both counted.
#pragma once

namespace llmt {

double comm_wait_s();  // the host's waits, plus the device's collective time when a source is set
double host_comm_wait_s();  // the host's waits alone

// The device's seconds in collectives so far (completed ones); set once by the NCCL communicator.
void set_device_comm_wait(double (*seconds)());

// Adds its lifetime to comm_wait_s(); nested timers count once (the outermost).
class CommWaitTimer {
 public:
  CommWaitTimer();
  ~CommWaitTimer();
  CommWaitTimer(const CommWaitTimer&) = delete;
  CommWaitTimer& operator=(const CommWaitTimer&) = delete;

 private:
  double start_ = -1.0;  // < 0: an inner timer, which adds nothing
};

}  // namespace llmt
