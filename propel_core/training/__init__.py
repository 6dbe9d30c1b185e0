"""Training with TRL, one concept a module (import the module that names what you need):

- ``trainer``: the TRL arguments every training sets alike, the policy, its LoRA adapter, the prompts;
- ``checkpoints``: where a training goes on from, what a resumed run keeps, the adapter saved last;
- ``generator``: the generator's GRPO loop (train stage, co-evolution, the frontier-shift experiment);
- ``generator_reward``: the generator's reward, validity and probe scores (the paper's R_hard, ...);
- ``audit``: real solver labels of the policy's own tasks while it trains (``train.audit``);
- ``solver``: the solver's training (solve-train, self-train) and its held-out evaluation;
- ``solver_reward``: the solver's reward, the verifier's grade or a reward model's score;
- ``feedback``: what every reward function gives back (context sampler, replay buffer, log);
- ``replay``: the replay buffer and the trainer that samples from it;
- ``ranking``: the Bradley-Terry ranker (the rank stage) and its metrics.
"""
