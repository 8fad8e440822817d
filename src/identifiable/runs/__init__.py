"""The runs behind the CLI's long commands: each trains or measures, writes a resumable
folder, and renders its report.

- `reproduce`: the paper's experiment into one report folder (`identifiable reproduce`);
- `compare`: two or more models' reproductions side by side (`identifiable compare`);
- `finetune`: label-free fine-tuning with the null-attention penalty, then its evaluation
  (`identifiable finetune`; the training steps themselves are `identifiable.training.loop`).
"""
