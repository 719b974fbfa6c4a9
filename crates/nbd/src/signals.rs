//! Stop signals for a daemon: SIGTERM and SIGINT are blocked in every thread (threads
//! inherit the mask, so block before starting any) and taken synchronously with `sigwait`
//! by one thread, which then stops the server in order. No handler runs asynchronously.

/// The blocked stop signals.
#[derive(Clone, Copy, Debug)]
pub struct StopSignals {
    set: libc::sigset_t,
}

impl StopSignals {
    /// Block SIGTERM and SIGINT in this thread and every thread it starts afterwards.
    pub fn block() -> StopSignals {
        // SAFETY: sigset_t is plain data that sigemptyset initialises; sigaddset and
        // pthread_sigmask only read and write it through the pointers given, during the calls.
        let set = unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, libc::SIGTERM);
            libc::sigaddset(&mut set, libc::SIGINT);
            libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
            set
        };
        StopSignals { set }
    }

    /// Wait for one of them; returns its number.
    pub fn wait(&self) -> i32 {
        let mut signal = 0;
        // SAFETY: `self.set` is initialised; `signal` is a valid out pointer for the call.
        unsafe { libc::sigwait(&self.set, &mut signal) };
        signal
    }
}

/// Ask this process to stop as a SIGTERM would (`flashraid stop` over the control socket):
/// every thread blocks the signal, so it goes to the one waiting in [`StopSignals::wait`],
/// which stops the server in order.
pub fn raise_stop() {
    // SAFETY: kill with this process's own id and a valid signal number touches no memory.
    unsafe { libc::kill(libc::getpid(), libc::SIGTERM) };
}

/// Unblock SIGTERM and SIGINT in `command`'s child before it runs its program: a blocked
/// mask survives exec, and a child such as fio must still stop on them (the terminal's
/// Ctrl-C, or a supervisor's SIGINT) while its parent takes them with `sigwait`.
pub fn unblock_in_child(command: &mut std::process::Command) -> &mut std::process::Command {
    use std::os::unix::process::CommandExt;
    // SAFETY: the closure runs in the forked child before exec and calls only
    // async-signal-safe functions (sigemptyset, sigaddset, pthread_sigmask) on a local set.
    unsafe {
        command.pre_exec(|| {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, libc::SIGTERM);
            libc::sigaddset(&mut set, libc::SIGINT);
            libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
            Ok(())
        })
    }
}

/// Let SIGPIPE end the process, as command-line tools do (`flashraid status | head` then
/// exits quietly instead of failing on a closed pipe). Never for a server: a client that
/// goes away would kill it.
pub fn default_sigpipe() {
    // SAFETY: setting a signal's disposition to SIG_DFL installs no handler code.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
}
