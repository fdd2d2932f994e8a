"""Training recipes beside RL: cold-start SFT, rejection-sampling distillation, reward
models on preference pairs, and the R1 pipeline that chains the stages."""
